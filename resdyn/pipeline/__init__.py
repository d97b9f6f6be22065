"""The pipeline's own machinery: the config (schema, validation, lookups), the DAG's job list and
each job's resources, the run plan, the fetch script and the per-job log."""
