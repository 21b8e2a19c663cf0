"""The one cost model of hetopt (DESIGN 3): FLOPs, memory, compute efficiency, communication."""
