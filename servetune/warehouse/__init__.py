"""servetune.warehouse"""
