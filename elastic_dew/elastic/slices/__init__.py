"""The slices: meshes over the active ones, their health, retries, the state's layout.

=====================  ===========================================================
module                 its job
=====================  ===========================================================
``mesh``               meshes over the active slices; batch shardings; whether a batch fits
``health``             the slice health check (one compile per slice)
``retry``              pathwaysutils' ``Manager`` and ``elastic_retry`` from the config
``manager``            ``SliceManager``: what the layer reads of pathwaysutils' ``Manager``
``loss_log``           pathwaysutils' handled slice-loss record as one WARNING line
``sharding``           the state's layout inside a slice: ``replicated``, ``fsdp``, a rule
=====================  ===========================================================
"""
