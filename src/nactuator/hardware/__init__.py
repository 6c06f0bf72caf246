"""nactuator.hardware"""
