// Command coredns is CoreDNS with the plugins the Corefile of a kind cluster (kubeadm's
// default) names, and no others: errors, health, ready, kubernetes, prometheus (the metrics
// plugin), forward, cache, loop, reload, loadbalance. CoreDNS's own main imports every plugin
// (core/plugin), the cloud DNS providers' SDKs among them: most of its build time.
// The directive order is CoreDNS's own (core/dnsserver), unchanged.
package main

import (
	"github.com/coredns/coredns/coremain"

	_ "github.com/coredns/coredns/plugin/cache"
	_ "github.com/coredns/coredns/plugin/errors"
	_ "github.com/coredns/coredns/plugin/forward"
	_ "github.com/coredns/coredns/plugin/health"
	_ "github.com/coredns/coredns/plugin/kubernetes"
	_ "github.com/coredns/coredns/plugin/loadbalance"
	_ "github.com/coredns/coredns/plugin/loop"
	_ "github.com/coredns/coredns/plugin/metrics"
	_ "github.com/coredns/coredns/plugin/ready"
	_ "github.com/coredns/coredns/plugin/reload"
)

func main() {
	coremain.Run()
}
