"""nactuator.data"""
