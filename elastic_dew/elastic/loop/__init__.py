"""The stop/resume loop and what it drives.

=====================  ===========================================================
module                 its job
=====================  ===========================================================
``protocol``           ``ElasticRun``: resume, step, offer each step to the tiers, scale up
``program``            what crosses the loop's boundary: ``Program``, ``Notice``, ``Finished``
``stopping``           ``Stopping``: a preemption's stop, the errors of a run that gives up
``attempt``            ``Attempt``: one attempt's mesh, step and state; a step in flight
``compiler``           ``StepCompiler``: compiled steps per (devices, batch), precompiling
``evaluation``         ``Evaluation``: a fixed set of batches on the current mesh
``data``               ``ElasticData``: Grain's ``ElasticIterator``, one global position
``recovery``           ``RecoveryTimer``: a resume's durations
=====================  ===========================================================
"""
