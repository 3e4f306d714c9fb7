"""The `ray up` tier (issue 34): Ray's own cluster launcher against real sshd and dockerd hosts, one network
namespace and one mount namespace per host (see docs/ec2.md "The ray up tier" and /work/shared/netns-hosts.md).

* `image`: the DLC stand-in (debootstrap minbase + docker import), cached by content hash under .cache/.
* `hosts`: the namespace hosts (a bridge in a switch namespace, one sshd + one dockerd per host).
* `cloud`: the "EC2 API" the test provider talks to (instances = hosts; terminate removes their containers).
* `provider`: the test NodeProvider (`provider: {type: external}`), imported by `ray up` here and by the
  autoscaler in the head container.
* `substitutions`: the declared difference between the rendered YAML and the one the tier runs.
"""
