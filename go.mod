module github.com/tvmdsoop/tvmdsoop

go 1.26

require (
	github.com/stretchr/testify v1.10.0
	github.com/wamuir/graft v0.10.0
	google.golang.org/protobuf v1.34.2
)

require (
	github.com/davecgh/go-spew v1.1.1 // indirect
	github.com/pmezard/go-difflib v1.0.0 // indirect
	gopkg.in/yaml.v3 v3.0.1 // indirect
)
