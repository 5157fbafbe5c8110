"""servetune.validation"""
