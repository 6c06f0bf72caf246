"""nactuator.sim"""
