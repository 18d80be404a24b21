"""The product's definitions (``make_defs``: assets, checks, jobs, the corpus schedule, sensors,
resources from the environment), loaded by Dagster's workspace machinery from this file in the
daemon tests of test_plan_operator.py and test_corpus_schedule.py, after the test set the
environment (data root, DATAMASK_CORPUS_CRON)."""

from datamask_pipeline.definitions import make_defs

defs = make_defs()
