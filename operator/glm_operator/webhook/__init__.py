"""The conversion webhook the API server calls to move GLMServices between served versions
(docs/install.md#upgrading-from-v1alpha1). It imports only the API types: the conversion
itself is `glm_operator.api.conversion`, pure; this package is the HTTPS around it."""
