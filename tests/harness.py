"""IPython startup file for the book build under `make test`: it records what each chapter draws.

tools/execute_book.py (``--record DIR``) links this file into an IPYTHONDIR of its own, so every
kernel that runs a chapter for the book runs it first. When the environment variable
SELFATTN_HARNESS_REPORT names a file, then after every cell it appends one JSON line:

* ``figures``: each PNG the cell saved (inline figures and explorer pictures alike): its width
  in pixels and the size in pixels of the smallest text drawn into it;
* ``explorers``: each explorer (``selfattn.book.kit.viz.explorer``) the cell displayed. The book
  build makes static explorers (every state precomputed); the harness builds the same explorer
  live, from the same function and controls, and drives it the way a reader's kernel would
  (:func:`drive`): every control set to each of its values in turn (did the picture change each
  time?), then bad sentences typed into its text box (did a message replace the picture, and
  did the picture come back?).

tests/test_colab.py and tests/test_browser.py read the report; nothing here asserts.
tests/test_colab.py also imports :func:`drive` to drive an explorer on Colab's ipywidgets 7.7.1.
"""

import itertools
import json
import os
import traceback


def drive(box):
    """Move every control of a live explorer, then type bad sentences; say what happened."""
    import ipywidgets

    kids = list(box.children)
    controls = [w for w in kids if isinstance(w, (ipywidgets.SelectionSlider, ipywidgets.Dropdown))]
    texts = [w for w in kids if isinstance(w, ipywidgets.Text)]
    image = next(w for w in kids if isinstance(w, ipywidgets.Image))
    message = next(w for w in kids if isinstance(w, ipywidgets.HTML))  # above the image

    def shown():
        return None if image.layout.display == "none" else bytes(image.value)

    first = shown()
    record = {"ipywidgets": ipywidgets.__version__, "controls": [], "bad_sentences": [],
              "models": sorted({f"{w._model_module}@{w._model_module_version}:{w._model_name}"
                                for w in [box, *kids, image.layout,
                                          *(getattr(w, "style", None) for w in kids)]
                                if w is not None})}
    for control in controls:
        pictures = [shown()]
        for index in range(1, len(control.options)):
            control.index = index
            pictures.append(shown())
        control.index = 0
        record["controls"].append({
            "name": control.description, "values": len(control.options),
            "changes": sum(a != b and b is not None for a, b in itertools.pairwise(pictures)),
            "back_to_first": shown() == first})
    for text in texts:
        good = text.value
        for bad in ["", " ".join(["the"] * 40)]:
            text.value = bad
            record["bad_sentences"].append({
                "typed": bad[:20], "message": message.value, "picture_hidden": shown() is None})
        text.value = good
        record["restored"] = shown() == first
    return record


def _install(ip, report_path):
    import io

    import ipywidgets
    import matplotlib
    from matplotlib.backend_bases import FigureCanvasBase
    from matplotlib.text import Text

    open(report_path, "a").close()  # this chapter was recorded, even if it draws nothing
    cell = {"figures": []}
    original_print_figure = FigureCanvasBase.print_figure

    def smallest_text_px(figure, dpi):
        sizes = [(t.get_fontsize() * dpi / 72, t.get_text().strip()[:30])
                 for t in figure.findobj(Text)
                 if t.get_visible() and t.get_text().strip()
                 and (t.axes is None or t.axes.get_visible())]
        return min(sizes) if sizes else (None, "")

    def print_figure(self, filename, *args, **kwargs):
        fmt = kwargs.get("format") or (filename if isinstance(filename, str) else "png")
        dpi = kwargs.get("dpi") or matplotlib.rcParams["savefig.dpi"]
        if dpi == "figure":
            dpi = self.figure.dpi
        size, text = smallest_text_px(self.figure, dpi)
        result = original_print_figure(self, filename, *args, **kwargs)
        if isinstance(filename, io.BytesIO) and str(fmt).endswith("png") and cell["recording"]:
            png = filename.getvalue()
            width = int.from_bytes(png[16:20], "big")  # the IHDR chunk
            cell["figures"].append({"width": width, "min_text_px": size, "text": text})
        return result

    FigureCanvasBase.print_figure = print_figure

    def live_twin(box):
        """The same explorer, built live: the arguments the static one was made from."""
        from selfattn.book.kit import viz

        return viz.explorer(**box.selfattn_explorer, static=False)

    def pre_run_cell(info):
        cell.clear()
        cell.update(figures=[], recording=True)

    def post_run_cell(result):
        entry = {"cell": result.info.raw_cell, "figures": cell["figures"], "explorers": []}
        value = result.result
        if isinstance(value, ipywidgets.Box) and "selfattn-explorer" in value._dom_classes:
            cell["recording"] = False  # the live twin draws the same pictures again
            try:
                entry["explorers"].append(drive(live_twin(value)))
            except Exception:  # recorded, so the test that reads the report can show it
                entry["explorers"].append({"error": traceback.format_exc()})
        if entry["figures"] or entry["explorers"]:
            with open(report_path, "a", encoding="utf-8") as f:
                f.write(json.dumps(entry) + "\n")

    ip.events.register("pre_run_cell", pre_run_cell)
    ip.events.register("post_run_cell", post_run_cell)


if os.environ.get("SELFATTN_HARNESS_REPORT"):
    _install(get_ipython(), os.environ["SELFATTN_HARNESS_REPORT"])  # noqa: F821 (IPython's)
