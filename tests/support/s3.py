"""S3 endpoint (moto server) for the tests."""
