"""servetune.loadgen"""
