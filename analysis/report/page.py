"""Assembling the report page: escaped text, figure JSON in a data block, plotly.js inline."""

from __future__ import annotations

import datetime as _dt
import html
import json
from dataclasses import dataclass, field
from typing import Any

import plotly.graph_objects as go
from plotly.offline import get_plotlyjs
from plotly.utils import PlotlyJSONEncoder

from bench_llm.core import __version__


@dataclass
class Section:
    """One section of a report page: a title, pre-escaped HTML, figures and notes."""

    title: str
    html: str = ""  # pre-escaped HTML shown above the figures
    figures: list[tuple[str, go.Figure]] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

_CSS = """
body{font-family:system-ui,-apple-system,Segoe UI,Roboto,sans-serif;margin:0;color:#222;background:#fafafa}
header{background:#1f2937;color:#fff;padding:14px 24px}header h1{margin:0;font-size:20px}
header p{margin:4px 0 0;color:#cbd5e1;font-size:13px}
main{padding:8px 24px 40px;max-width:1500px}
section{background:#fff;border:1px solid #e5e7eb;border-radius:6px;margin:16px 0;padding:12px 16px}
h2{font-size:17px;margin:4px 0 10px}h3{font-size:15px;margin:10px 0 6px}
table{border-collapse:collapse;font-size:12.5px;margin:6px 0;overflow-x:auto;display:block}
th,td{border-bottom:1px solid #e5e7eb;padding:3px 8px;text-align:right;white-space:nowrap}
th{background:#f3f4f6}td:first-child,th:first-child{text-align:left}
table.kv td{text-align:left}
.headline{border-left:6px solid #16a34a;background:#f0fdf4;padding:8px 14px;margin-bottom:10px}
.headline.none{border-left-color:#dc2626;background:#fef2f2}
.headline .pick{font-size:15px}.headline .label{color:#166534;text-transform:uppercase;font-size:12px;letter-spacing:.05em}
.headline .name{font-size:26px;font-weight:700}.headline .gpus{font-size:15px;color:#374151}
.headline .cap{font-size:15px;margin:2px 0 4px}.headline .cap .value{font-size:22px;font-weight:700}
.headline table.kv td{white-space:normal}
.row{display:flex;gap:16px;flex-wrap:wrap}.box{flex:1 1 320px}
.notes{color:#92400e;background:#fffbeb;border-left:4px solid #f59e0b;padding:4px 12px;font-size:13px}
.muted{color:#6b7280;font-size:12.5px}.fig{width:100%;min-height:300px}
"""

_BOOT = """
(function(){
  var all = JSON.parse(document.getElementById('bench-figures').textContent);
  var data = all.figures, drawn = 0, failed = [];
  data.forEach(function(f){
    try {
      var spec = f.spec;
      spec.layout = spec.layout || {};
      if (all.template) { spec.layout.template = all.template; }
      var cfg = {responsive: true, displaylogo: false};
      Plotly.newPlot(f.id, spec.data, spec.layout || {}, cfg);
      drawn += 1;
    } catch (e) { failed.push(f.id + ': ' + e); console.error('figure ' + f.id + ' failed: ' + e); }
  });
  document.body.setAttribute('data-figures-expected', String(data.length));
  document.body.setAttribute('data-figures-drawn', String(drawn));
})();
"""


def _script_safe(text: str) -> str:
    """JSON text safe inside a <script> element (no '</script>', no HTML comment openers)."""
    return text.replace("<", "\\u003c").replace(">", "\\u003e").replace("&", "\\u0026").replace("\u2028", "\\u2028").replace("\u2029", "\\u2029")


def render_page(title: str, source: str, sections: list["Section"], notes: list[str], now: _dt.datetime) -> str:
    esc = html.escape
    figs: list[dict[str, Any]] = []
    shared_template: Any = None
    body: list[str] = []
    if notes:
        body.append('<div class="notes"><ul>' + "".join(f"<li>{esc(n)}</li>" for n in notes) + "</ul></div>")
    for sec in sections:
        if not (sec.html or sec.figures or sec.notes):
            continue
        body.append(f"<section><h2>{esc(sec.title)}</h2>{sec.html}")
        if sec.notes:
            body.append('<div class="notes"><ul>' + "".join(f"<li>{esc(n)}</li>" for n in sec.notes) + "</ul></div>")
        for name, fig in sec.figures:
            fid = f"fig-{len(figs)}-{esc(name)}"
            body.append(f'<div class="fig" id="{fid}"></div>')
            spec = fig.to_plotly_json()
            template = spec.get("layout", {}).pop("template", None)
            if template is not None:
                shared_template = template  # identical in every figure: stored once
            figs.append({"id": fid, "spec": spec})
        body.append("</section>")
    data_json = json.dumps({"template": shared_template, "figures": figs}, cls=PlotlyJSONEncoder)
    return (
        "<!DOCTYPE html>\n<html lang='en'><head><meta charset='utf-8'>"
        f"<meta name='viewport' content='width=device-width, initial-scale=1'><title>{esc(title)}</title>"
        f"<style>{_CSS}</style>"
        f"<script>{get_plotlyjs()}</script></head><body>"
        f"<header><h1>{esc(title)}</h1><p>results: {esc(source)} · generated {esc(now.strftime('%Y-%m-%d %H:%M UTC'))}"
        f" by bench {esc(__version__)} · all figures work offline</p></header><main>"
        + "".join(body)
        + "</main>"
        f'<script type="application/json" id="bench-figures">{_script_safe(data_json)}</script>'
        f"<script>{_BOOT}</script></body></html>\n"
    )
