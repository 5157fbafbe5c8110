"""servetune.warehouse: the Postgres result warehouse (tables, migrations, loader, named queries)."""

from servetune.warehouse.loader import LoadReport, TrialLoad, load_result

__all__ = ["LoadReport", "TrialLoad", "load_result"]
