"""The Spark data source on a pgbroker Stream (option ``stream``)."""
