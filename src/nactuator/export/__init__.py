"""nactuator.export"""
