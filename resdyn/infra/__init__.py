"""Infrastructure: configuration, hub/model/data loaders, the zoo, provenance, code versions, cost model, shared linear algebra."""
