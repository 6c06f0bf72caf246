"""nactuator.models"""
