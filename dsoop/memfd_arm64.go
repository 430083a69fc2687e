package dsoop

// sysMemfdCreate is memfd_create(2)'s number (Go's frozen syscall package lacks it).
const sysMemfdCreate = 279
