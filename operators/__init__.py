"""Airflow's side of servetune: thin task callables over the library, and their configuration.

Nothing here measures, tunes or validates: every task calls one servetune function. The DAGs in
dags/ compose these into task groups with a pool per GPU runner and a queue per GPU type.
"""
