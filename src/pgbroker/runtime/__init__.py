"""The consumer runtime: App, Worker, the stream worker and their parts."""
