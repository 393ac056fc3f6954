"""pruning"""
