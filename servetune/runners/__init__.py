"""servetune.runners"""
