"""What the operator writes into an LLMEndpoint's status. Pure functions.

`conditions` keeps the `metav1.Condition` list-map; `endpoint` computes the fields the reconcile
owns (replicas, selector, Available, Progressing, Degraded, CapacityLimited); `kstatus` derives
Ready, Reconciling and Stalled from those; `loops` builds the sections the capacity and routing
loops write (capacity, slo, cost, decisions).
"""
