# Convenience targets; the README's two commands are the supported entry points.
.PHONY: demo test airflow

demo:
	bash scripts/main-job.sh

test:
	bash scripts/test.sh

# Airflow UI on http://127.0.0.1:8080 with servetune's DAGs (no example DAGs); Ctrl-C stops it.
airflow:
	bash scripts/bootstrap.sh
	.venv/bin/servetune airflow standalone
