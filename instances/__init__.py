"""The bundled instances (YAML), shipped inside hetopt as `hetopt.bundled`: `hetopt instances`
lists them."""
