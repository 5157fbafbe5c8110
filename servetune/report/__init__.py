"""servetune.report"""
