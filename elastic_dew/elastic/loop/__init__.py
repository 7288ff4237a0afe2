"""The stop/resume loop and what it drives.

=====================  ===========================================================
module                 its job
=====================  ===========================================================
``protocol``           ``ElasticRun``: resume, step, offer each step to the tiers, stop
``compiler``           ``StepCompiler``: compiled steps per (devices, batch), precompiling
``evaluation``         ``Evaluation``: a fixed set of batches on the current mesh
``data``               ``ElasticData``: Grain's ``ElasticIterator``, one global position
``recovery``           ``RecoveryTimer``: a resume's durations
=====================  ===========================================================
"""
