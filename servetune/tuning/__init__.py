"""servetune.tuning"""
