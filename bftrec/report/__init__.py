"""Reporting: the statistics behind the tables (``bftrec.report.stats``)."""
