"""Plotly figures in a notebook that open offline: plotly.js embedded once, and no MathJax (nor
anything else) fetched from a CDN, which plotly's own ``notebook`` renderer always adds."""

from __future__ import annotations

from typing import Any

RENDERER = "gpt-optuna"
"""The name the renderer is registered under in ``plotly.io.renderers``."""


def use_offline_renderer() -> None:
    """Register the offline renderer and make it plotly's default (``fig.show()`` draws with it)."""
    import plotly.io as pio
    from plotly.io.base_renderers import NotebookRenderer

    class OfflineNotebookRenderer(NotebookRenderer):
        """plotly's ``notebook`` renderer without the MathJax script it loads from a CDN."""

        def to_mimebundle(self, fig_dict: Any) -> dict[str, str]:
            page = pio.to_html(
                fig_dict,
                config=self.config,
                include_plotlyjs=self.include_plotlyjs,
                include_mathjax=False,
                full_html=False,
                default_width="100%",
                default_height=525,
                validate=False,
            )
            return {"text/html": page}

    pio.renderers[RENDERER] = OfflineNotebookRenderer()
    pio.renderers.default = RENDERER
