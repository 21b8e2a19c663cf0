"""The one cost model of hetopt (docs/cost-model.md): FLOPs, memory, compute efficiency,
communication."""
