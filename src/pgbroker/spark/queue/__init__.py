"""The Spark data source on a queue: batch reads and writes, and Spark streaming."""
