"""nactuator.control"""
