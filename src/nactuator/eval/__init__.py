"""nactuator.eval"""
