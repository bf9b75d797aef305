"""``llmperf dashboard``: a static site of a baseline name's history, and a page per gated run.

Written from a store (a directory or an fsspec URL) through the store and history APIs, never the
load or network stack; opened from disk or served from GitHub Pages with no network access at view
time (plotly.js travels with the pages). :mod:`~pytest_llmperf.dashboard.data` reads what the pages
show, :mod:`~pytest_llmperf.dashboard.figures` draws the charts (plotly figures as data, sparklines
as inline SVG) and :mod:`~pytest_llmperf.dashboard.site` writes the pages; docs/dashboard.md
describes the site.

Needs the ``dashboard`` extra (plotly): ``pip install 'pytest-llmperf[dashboard]'``.
"""

from __future__ import annotations

from pytest_llmperf.dashboard.data import SiteData, load_site_data
from pytest_llmperf.dashboard.site import GatedRun, SiteResult, write_run_page, write_site

__all__ = ["GatedRun", "SiteData", "SiteResult", "load_site_data", "write_run_page", "write_site"]
