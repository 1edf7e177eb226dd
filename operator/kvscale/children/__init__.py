"""What the operator creates for an endpoint, rendered as plain dicts for server-side apply.

`engine` renders the engine's Service, PodDisruptionBudget and Deployment (and the labels and
owner every child shares), `engine_args` the engine's command line per engine kind, `router` the
router's RBAC, Deployment, Service and routing ConfigMap. Pure functions.
"""
