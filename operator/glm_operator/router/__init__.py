"""The router: `glm-operator router` (once `glm-operator gateway --router`), in front of a
service's pools (docs/routing.md). It reaches the pods' gateways with the gateway's wire layer
(gateway/wire/) and shares its front door (keys, errors, the HTTP server); the gateway
imports nothing of it."""
