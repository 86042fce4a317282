#!/bin/sh
# hpvc cluster gx, host amd1: its bridge joined to the other hosts'.
# VXLAN VNI 15719311 on UDP port 4789, from this host's fabric address 10.0.0.2
# to amd0 10.0.0.1, intel 10.0.1.1; node MTU 8950 (fabric MTU 9000).
# `hpvc up` makes these changes itself. By hand: run as root, once, when the bridge
# hpvc-gx is up with this host's address on it, 10.90.0.254/24.
set -e

# Only the other hosts' kernels may send into its VNI (bits 32-55 of the VXLAN header):
# no local user's socket, no other host, nothing routed through this one.
nft -f - <<'EOF'
add table inet hpvc-vni15719311
add chain inet hpvc-vni15719311 input { type filter hook input priority -200; policy accept; }
flush chain inet hpvc-vni15719311 input
add chain inet hpvc-vni15719311 output { type filter hook output priority -200; policy accept; }
flush chain inet hpvc-vni15719311 output
add chain inet hpvc-vni15719311 forward { type filter hook forward priority -200; policy accept; }
flush chain inet hpvc-vni15719311 forward
add rule inet hpvc-vni15719311 input udp dport 4789 @th,96,24 15719311 ip saddr { 10.0.0.1, 10.0.1.1 } fib saddr . iif oif exists udp sport 512-1023 accept
add rule inet hpvc-vni15719311 input udp dport 4789 @th,96,24 15719311 counter drop comment "hpvc: only the cluster's other hosts' kernels may send into this VNI"
add rule inet hpvc-vni15719311 output udp dport 4789 @th,96,24 15719311 udp sport != 512-1023 counter drop comment "hpvc: no local user's socket may send into this VNI"
add rule inet hpvc-vni15719311 forward udp dport 4789 @th,96,24 15719311 counter drop comment "hpvc: nothing routed through this host may send into this VNI"
EOF

# The bridge's VXLAN port; the forwarding database is written, never learned.
ip link add vxc1cbb8108bc8f type vxlan id 15719311 local 10.0.0.2 dstport 4789 nolearning srcport 512 1024
ip link set vxc1cbb8108bc8f master hpvc-gx mtu 8950 up
bridge link set dev vxc1cbb8108bc8f learning off

# host amd0: broadcast once, then its 2 node(s)
bridge fdb append 00:00:00:00:00:00 dev vxc1cbb8108bc8f dst 10.0.0.1 self permanent
bridge fdb replace 02:c1:0a:5a:00:03 dev vxc1cbb8108bc8f dst 10.0.0.1 self permanent  # compute0 10.90.0.3
bridge fdb replace 02:c1:0a:5a:00:03 dev vxc1cbb8108bc8f master static
bridge fdb replace 02:c1:0a:5a:00:04 dev vxc1cbb8108bc8f dst 10.0.0.1 self permanent  # compute1 10.90.0.4
bridge fdb replace 02:c1:0a:5a:00:04 dev vxc1cbb8108bc8f master static

# host intel: broadcast once, then its 1 node(s)
bridge fdb append 00:00:00:00:00:00 dev vxc1cbb8108bc8f dst 10.0.1.1 self permanent
bridge fdb replace 02:c1:0a:5a:00:02 dev vxc1cbb8108bc8f dst 10.0.1.1 self permanent  # head0 10.90.0.2
bridge fdb replace 02:c1:0a:5a:00:02 dev vxc1cbb8108bc8f master static
