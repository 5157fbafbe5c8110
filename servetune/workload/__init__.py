"""servetune.workload"""
