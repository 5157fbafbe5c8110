#!/usr/bin/env bash
# Runs once, on an empty data volume (the postgres image's /docker-entrypoint-initdb.d): one database
# per component, each owned by its own role, and a read-only role for Grafana on the warehouse.
# Passwords come from the environment and reach SQL only as psql variables (:'name' quotes them).
set -euo pipefail
psql -v ON_ERROR_STOP=1 --username "$POSTGRES_USER" --dbname postgres \
  -v airflow_pw="$AIRFLOW_DB_PASSWORD" \
  -v servetune_pw="$SERVETUNE_DB_PASSWORD" \
  -v grafana_pw="$GRAFANA_DB_PASSWORD" <<'SQL'
CREATE ROLE airflow LOGIN PASSWORD :'airflow_pw';
CREATE DATABASE airflow OWNER airflow;
CREATE ROLE servetune LOGIN PASSWORD :'servetune_pw';
CREATE DATABASE servetune OWNER servetune;
CREATE ROLE grafana_reader LOGIN PASSWORD :'grafana_pw';
\connect servetune
REVOKE CREATE ON SCHEMA public FROM PUBLIC;
GRANT CONNECT ON DATABASE servetune TO grafana_reader;
GRANT USAGE ON SCHEMA public TO grafana_reader;
-- tables and views the warehouse migrations create later, as the servetune role
ALTER DEFAULT PRIVILEGES FOR ROLE servetune IN SCHEMA public GRANT SELECT ON TABLES TO grafana_reader;
SQL
