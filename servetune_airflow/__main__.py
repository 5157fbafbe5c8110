"""``python -m servetune_airflow``: print the folder of servetune's DAG files, for Airflow's ``dags_folder``."""

from servetune_airflow import DAGS_FOLDER

print(DAGS_FOLDER)
