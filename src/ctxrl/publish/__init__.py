"""Publishing a run: the HTML report of everything a run folder holds (:mod:`ctxrl.publish.report`) and the
export of a trained checkpoint to a serving stack (:mod:`ctxrl.publish.export`).

This layer sits above ``evolve`` and ``train``: it reads every layer's output and no layer reads it.
"""
