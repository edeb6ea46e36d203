//! Pod sandboxes: pinned namespaces, CNI networking, hostname/resolv.conf/hosts. Being written.
