"""Skill evolution: skills and their lineage, contrastive notes, proposers, the paired held-out gate.

One round is a short composition of the pieces; :mod:`ctxrl.evolve.loop` is that composition over the rollout
loop (``ctxrl evolve``, settings in :class:`ctxrl.evolve.config.EvolveConfig`), and
``tests/evolve/evolve_driver.py`` runs it with a fake evaluator:

1. ``lineage.begin_round(r)``; the round's parent (the incumbent, :meth:`~ctxrl.evolve.lineage.Lineage.incumbent`,
   or a skill of the Pareto pool, :meth:`~ctxrl.evolve.lineage.Lineage.pool`) runs the train tasks with repeats, each graded episode recorded as it completes (:meth:`~ctxrl.evolve.lineage.Lineage.record_episode`,
   skipping :meth:`~ctxrl.evolve.lineage.Lineage.graded` ones on resume);
2. :func:`~ctxrl.evolve.notes.build_notes` over those episodes;
3. a :class:`~ctxrl.evolve.proposers.Proposer` writes N candidates, each checked by
   :func:`~ctxrl.evolve.proposal.read_proposal` and stored with
   :meth:`~ctxrl.evolve.lineage.Lineage.record_proposals` (dropped ones with their reason);
4. each candidate and the incumbent run the same dev tasks and seeds, look by look
   (:meth:`~ctxrl.evolve.gate.CtxrlGate.looks`), until :meth:`~ctxrl.evolve.gate.CtxrlGate.decide` decides, with
   the candidate's proposal number from :meth:`~ctxrl.evolve.lineage.Lineage.gate_index`;
5. :func:`~ctxrl.evolve.gate.choose` among the accepted; :meth:`~ctxrl.evolve.lineage.Lineage.finish_round`
   promotes the winner and rewrites ``best_skill/SKILL.md``.

Modules: :mod:`~ctxrl.evolve.skill`, :mod:`~ctxrl.evolve.rules`, :mod:`~ctxrl.evolve.proposal`, :mod:`~ctxrl.evolve.notes`, :mod:`~ctxrl.evolve.proposers`,
:mod:`~ctxrl.evolve.gate`, :mod:`~ctxrl.evolve.lineage`, :mod:`~ctxrl.evolve.config`, :mod:`~ctxrl.evolve.loop`.
Importing them needs neither torch nor vLLM.
"""
