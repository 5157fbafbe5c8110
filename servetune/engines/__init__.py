"""servetune.engines"""
