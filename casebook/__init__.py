"""casebook: the pipeline library behind the Snakemake workflow.

Data flows one way: validated configs -> stage records (JSON, schema-checked) ->
figures with six-condition sidecars -> static pages. Kernels never know the pipeline,
measurement never knows pages, and pages never run kernels.
"""
