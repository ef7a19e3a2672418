"""One module per task type: its input model, its steps, its scripted-model answers.

Adding a task type is adding a module here: ``WorkflowsConfig.ready`` imports
every module of this package, and each registers its type with
``tasks.registry.register``.
"""
