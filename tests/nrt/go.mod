module numaguard.test/nrt

go 1.26.7

require github.com/k8stopologyawareschedwg/noderesourcetopology-api v0.1.2
