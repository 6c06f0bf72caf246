"""nactuator.training"""
