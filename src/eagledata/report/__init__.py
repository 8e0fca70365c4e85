"""``eagledata report``: the run's history in one self-contained HTML file.

``rundata`` gathers (records streamed by ``records_scan``, the headline from ``headline``),
``plots_time``, ``plots_dist`` and ``plots_canary`` draw, ``page`` assembles; ``build_report``
wires them.
"""

from eagledata.report.build import build_report, report_html

__all__ = ["build_report", "report_html"]
