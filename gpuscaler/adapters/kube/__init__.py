"""The Kubernetes adapter's pieces: `api` is the client every other piece talks through."""
