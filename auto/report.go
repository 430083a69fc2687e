package auto

// ShapeRecord is what became of one input shape of a cluster.
type ShapeRecord struct {
	// Shape is the inputs' shapes, as "[1,224,224,3] [64]".
	Shape string `json:"shape"`
	// Status is "timing" (being timed against TF), "tvm" or "tf".
	Status string `json:"status"`
	// Reason says why the shape runs TF; empty otherwise.
	Reason string `json:"reason"`
	// CompileSeconds is how long the compile (or the cache's answer) took.
	CompileSeconds float64 `json:"compile_seconds"`
	// Library and SHA256 are the compiled library's path and digest; empty
	// where none was made.
	Library string `json:"library"`
	SHA256  string `json:"sha256"`
	// FLOPs are those of the convolutions and matmuls in the compiled part
	// for this shape, by the compiler's count (0 where it made none).
	FLOPs int64 `json:"flops"`
}

// Cluster is one cluster the pass made (or tried to make), in the report.
type Cluster struct {
	Name string `json:"name"`
	// Graph is the function whose graph it was cut from.
	Graph string `json:"graph"`
	// Ops are the TF op types in it, in the graph's order.
	Ops []string `json:"ops"`
	// Status is that of the shape that ran last ("pending" before any ran),
	// or "tf" where the pass could not make the cluster.
	Status string `json:"status"`
	// Reason says why Status is "tf".
	Reason string `json:"reason"`
	// CompileSeconds is the sum of its shapes' compiles.
	CompileSeconds float64       `json:"compile_seconds"`
	Shapes         []ShapeRecord `json:"shapes"`
}

// The clusters since the pass was last turned on, in the order made; guarded by mu.
var (
	clusters []*Cluster
	byName   = map[string]*Cluster{}
)

func resetReport() {
	clusters, byName = nil, map[string]*Cluster{}
}

// ClusterMade records a cluster the pass made in graph; a non-empty reason
// says why it left the cluster's ops to TF instead.
func ClusterMade(name, graph string, ops []string, reason string) {
	mu.Lock()
	defer mu.Unlock()
	c := &Cluster{Name: name, Graph: graph, Ops: ops, Status: "pending", Reason: reason, Shapes: []ShapeRecord{}}
	if reason != "" {
		c.Status = "tf"
	}
	clusters = append(clusters, c)
	if name != "" {
		byName[name] = c
	}
}

// ShapeEvent records what became of one input shape of a cluster.
func ShapeEvent(cluster string, record ShapeRecord) {
	mu.Lock()
	defer mu.Unlock()
	c, ok := byName[cluster]
	if !ok { // a cluster made before the report was reset
		c = &Cluster{Name: cluster, Ops: []string{}, Shapes: []ShapeRecord{}}
		clusters = append(clusters, c)
		byName[cluster] = c
	}
	found := false
	for i := range c.Shapes {
		if c.Shapes[i].Shape == record.Shape {
			c.Shapes[i], found = record, true
		}
	}
	if !found {
		c.Shapes = append(c.Shapes, record)
	}
	c.Status, c.Reason = record.Status, record.Reason
	c.CompileSeconds = 0
	for _, s := range c.Shapes {
		c.CompileSeconds += s.CompileSeconds
	}
}

// Report returns a copy of the clusters recorded since the pass was turned on.
func Report() []Cluster {
	mu.Lock()
	defer mu.Unlock()
	out := make([]Cluster, 0, len(clusters))
	for _, c := range clusters {
		copied := *c
		copied.Ops = append([]string{}, c.Ops...)
		copied.Shapes = append([]ShapeRecord{}, c.Shapes...)
		out = append(out, copied)
	}
	return out
}
