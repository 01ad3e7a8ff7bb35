"""From records to what a reader sees: the figures and site stages, and what they read.

- ``evidence``: all records of one case on one target, in one object;
- ``conditions``: a figure's six conditions, assembled from records;
- ``status``: a case's status on one target, derived from its records;
- ``history``: every timed figure kept per commit it was measured at;
- ``figures``: the figures rule (figures.smk), SVGs with six-condition sidecars;
- ``page_tables``: the pages' result tables (pandas);
- ``methods``: the methods page's facts;
- ``site``: the page, methods, records, static, index and site rules (site.smk);
- ``verdict``: how a run ends (``python -m casebook.report.verdict``).
"""
