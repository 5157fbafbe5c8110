"""Airflow's side of servetune: thin task callables over the library, their configuration, and the DAGs.

Nothing here measures, tunes or validates: every task calls one servetune function. The DAG files in
``dags/`` (shipped with the package, not imported by it) compose these into task groups with a pool per
GPU runner and a queue per GPU type; point Airflow's ``dags_folder`` at ``DAGS_FOLDER`` (printed by
``python -m servetune_airflow``) or link it into an existing one (docs/airflow-install.md).
"""

from pathlib import Path

DAGS_FOLDER = Path(__file__).resolve().parent / "dags"
